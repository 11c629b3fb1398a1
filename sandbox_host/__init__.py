"""The sandbox host: sandboxes, agents, journals, translation to AG-UI, and the run driver.

docs/design.md §5. Submodules: :mod:`sandbox_host.providers`, :mod:`sandbox_host.journal`,
:mod:`sandbox_host.agents`, :mod:`sandbox_host.translate`.
"""
