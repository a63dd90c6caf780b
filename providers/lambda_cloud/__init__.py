"""Lambda Cloud (provider id `lambda`): the adapter is in cloud.py, its `[providers.lambda]`
section in config.py. Importing this package imports neither, so the registry stays cheap."""
