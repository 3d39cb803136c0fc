"""The Textual shell: the App, its screens, the command palette and the .tcss.

`app` wires one core Session to the widgets (create_app is the one factory), `views` builds the widgets' data
from the Session's frozen views, `bench` the measuring keys and screens, `commands` the palette's flag
commands, `advisor` the advisor key `v` and its screen, `trust` the SSH host-key prompt. May import app.core,
widgets and, in create_app only, app.connect.
"""
