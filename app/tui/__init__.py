"""The Textual shell of tunedash: the App, its screens and the command palette."""
