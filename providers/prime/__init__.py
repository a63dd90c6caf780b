"""Prime Intellect (provider id `prime`): the adapter is in cloud.py, its `[providers.prime]`
section in config.py. Importing this package imports neither, so the registry stays cheap."""
