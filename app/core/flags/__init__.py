"""Flags: per-backend catalogs (kinds, choices, versions), values, toggle rules, discovery from the server.

`catalog` is data (one FlagSpec per flag), `values` looks up, checks, parses and renders flag values,
`toggles` holds what the dashboard's keys do to flags, `discovery` reads which flags the installed server
accepts from its own `--help` (cached per interpreter) and holds the catalog against them.
May import app.core.hosts (discovery runs a command on the host) and app.core.data; nothing above it.
"""
