"""The process boundary: the app's worker processes and the text that crosses into Markdown."""
