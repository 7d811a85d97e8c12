package main

import (
	"flag"
	"slices"
	"strings"
)

// parseAnywhere parses fs over args with flags allowed before, between and
// after the positional words (the flag package stops at the first word),
// and returns the words in order. Everything after a "--" is a word.
func parseAnywhere(fs *flag.FlagSet, args []string) ([]string, error) {
	var tail []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, tail = args[:i], args[i+1:]
	}
	var words []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return append(words, tail...), nil
		}
		words, args = append(words, args[0]), args[1:]
	}
}

// valueless are the top-level flags that take no value, so that
// splitCommand does not mistake the word after them for their value.
var valueless = map[string]bool{"h": true, "help": true, "json": true, "dry-run": true, "create-missing": true}

// splitCommand finds meshd's command, the first word that is not a flag's
// value, and returns it with the other arguments in order: flags given
// before the command belong to it too. "" means no command (serve).
func splitCommand(args []string) (string, []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return "", args
		case !strings.HasPrefix(a, "-") || a == "-":
			return a, append(slices.Clip(args[:i]), args[i+1:]...)
		case strings.Contains(a, "="):
		case valueless[strings.TrimLeft(a, "-")]:
		default:
			i++ // the flag's value
		}
	}
	return "", args
}
