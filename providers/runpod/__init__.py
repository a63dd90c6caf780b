"""RunPod (provider id `runpod`): the adapter is in cloud.py, its `[providers.runpod]` section in
config.py. Importing this package imports neither, so the registry stays cheap."""
