package main

import "github.com/urfave/cli/v2"

// adminCommands are the commands that change what the builder does while it runs.
func adminCommands() []*cli.Command {
	return nil
}
