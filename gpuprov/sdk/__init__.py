"""Talking to Temporal: the client other services use, the connection, the payload codec."""
