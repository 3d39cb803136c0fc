"""Profiles: the TOML schema reader, the validated Profile, overrides, argv rendering and flag diffs.

`types` holds the Profile and its parts, `schema` reads and checks the TOML (errors name the file and key),
`loading` finds, resolves and overrides profiles, `render` turns a Profile into the argv and environment
that launch it and compares two flag sets. May import app.core.flags and app.core.data only.
"""
