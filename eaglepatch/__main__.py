"""`python -m eaglepatch`: the same entry point as the `eaglepatch` command."""

from eaglepatch.entry import main

main()
