"""roll-cluster's command-line tool for users: the offline plan and the daily commands (status, logs, ssh, dashboard,
stop, resubmit, pause, resume, cost, list, down). It runs the Pulumi CLI and the commands the stack's outputs hold;
the program never imports it. `python3 -m companion --help`."""
