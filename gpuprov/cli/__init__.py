"""The `gpuprov` command: its entry, one module per command group, the dev and demo stacks."""
