"""roll-cluster's command-line companion: what users do every day, as commands instead of `pulumi stack output X
| sh`. It reads the stack's outputs through Pulumi's Automation API and runs the commands they hold; the program
never imports it. `python3 -m companion --help`."""
