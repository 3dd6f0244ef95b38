"""The task file: its declaration, reading and checks, the reference table, and the settings
the VM decodes. Empty on purpose: importing one module here imports no other."""
