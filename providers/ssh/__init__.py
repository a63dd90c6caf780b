"""Machines you own (SSH) (provider id `ssh`): the adapter is in cloud.py, its `[providers.ssh]`
section in config.py. Importing this package imports neither, so the registry stays cheap."""
