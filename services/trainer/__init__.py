"""tuneloop trainer: the provider-agnostic training runtime, a CLI launched once per job (not a
long-running service). It takes a job config and a payload, trains, checkpoints to object storage
and reports over signed webhooks; no orchestration logic lives here. Built by the trainer issue."""
