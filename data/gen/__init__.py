"""The modules of ``data/generate.py``: shared helpers, one module per workspace, the task files.

Not an installed package: ``data/generate.py`` puts ``data/`` on ``sys.path`` and imports it as
``gen``; the modules import each other relatively."""
