"""The web chat page: plain HTML/JS/CSS shipped in the package, a client of the public HTTP API."""
