"""Lambda Cloud (provider id `lambda`; the directory is the id, so it is imported with importlib or
relative imports: `lambda` is a keyword): the adapter is in cloud.py, its `[providers.lambdalabs]`
section in config.py. Importing this package imports neither, so the registry stays cheap."""
