"""baton's tools: the ``baton`` command, the local cluster launcher, the demo and the test
servers (installed with the ``tools`` extra). They may import every service; no service
imports them.
"""
