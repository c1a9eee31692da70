"""Media of a request: processing options, fetching under SSRF rules, local files, render's features."""
