"""The recovery benchmark's parts; ``bench/recovery.py`` is the command."""
