"""AWS EC2 adapter (provider id `aws`): the adapter is in cloud.py, its `[providers.aws]` section in
config.py. Importing this package imports neither, so the registry stays cheap."""
