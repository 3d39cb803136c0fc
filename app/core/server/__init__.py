"""The server on a host: lifecycle state machine, kill and release, log-event -> state, job records, driver lock.

`lifecycle` moves a profile's server through its states and publishes `events` (and a frozen LifecycleView),
`preflight` refuses a launch onto a running job, a taken port or held GPUs and claims the record before the
spawn, `release` kills a job's group and confirms the GPUs free, `states` maps log events to states (used by the
lifecycle and by `status`), `jobs` proves a group is the job's and reads and writes its record (compare-and-swap),
`driver` is the one-driver lock, `status` inspects a job without driving it, `health` asks a health URL. May
import app.core.hosts, telemetry, logs, profiles, flags, errors and data (never app.core.measure: it is above).
"""
