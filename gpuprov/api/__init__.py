"""The control-plane HTTP API: the app, its authentication, and its routes by resource."""
