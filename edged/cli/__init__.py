"""The `edged` command: serving, the client commands, import, probes, the demo and the bench."""
