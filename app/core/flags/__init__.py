"""Flags: per-backend catalogs (kinds, choices, versions), values, toggle rules, discovery from the server.

`catalog` is data (one FlagSpec per flag), `rules` checks, parses, renders and toggles flag values,
`discovery` reads which flags the installed server accepts from its own `--help` (cached per interpreter).
May import app.core.hosts (discovery runs a command on the host) and app.core.data; nothing above it.
"""
