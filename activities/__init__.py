"""Every side effect of gpuprov: cloud calls, SSH, database. Workflows only orchestrate these."""
