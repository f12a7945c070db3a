"""`python -m ondevice` runs the CLI."""

from ondevice.cli.app import main

main()
