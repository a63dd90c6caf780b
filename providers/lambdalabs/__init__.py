"""Lambda Cloud (provider id `lambda`; the folder is `lambdalabs` because `lambda` is a Python
keyword): the adapter is in cloud.py, its `[providers.lambda]` section in config.py. Importing this
package imports neither, so the registry stays cheap."""
