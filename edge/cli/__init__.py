"""The commands: one module per subcommand, each with register() (and main() for its scripts/ caller); argparse only."""
