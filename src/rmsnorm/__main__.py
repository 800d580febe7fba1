"""``python -m rmsnorm`` is the ``rmsnorm`` command."""

from .cli import main

main()
