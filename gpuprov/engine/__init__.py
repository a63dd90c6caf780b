"""The worker process: wiring activities and workflows, schedules, the temporal binary."""
