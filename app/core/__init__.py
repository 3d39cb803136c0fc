"""The UI-free engine of tunedash: profiles, hosts, telemetry, lifecycle, log watch."""
