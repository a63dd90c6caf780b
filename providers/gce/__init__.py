"""Google Compute Engine (provider id `gce`): the adapter is in cloud.py, its `[providers.gce]`
section in config.py. Importing this package imports neither, so the registry stays cheap."""
