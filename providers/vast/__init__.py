"""Vast.ai (provider id `vast`): the adapter is in cloud.py, its `[providers.vast]` section in
config.py. Importing this package imports neither, so the registry stays cheap."""
