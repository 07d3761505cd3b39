package cli

import (
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/alecthomas/kong"
)

// help prints kong's help, then the examples of the command it is about.
func (t Tool) help(opts kong.HelpOptions, kctx *kong.Context) error {
	if err := kong.DefaultHelpPrinter(opts, kctx); err != nil {
		return err
	}
	examples := t.Examples[commandPath(kctx.Selected())]
	if len(examples) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("\nExamples:\n")
	for _, e := range examples {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	_, err := io.WriteString(kctx.Stdout, b.String())
	return err
}

// commandPath is a command's path as the user types it ("net up"; "" for the
// tool), without the aliases and arguments that kong's Node.Path adds.
func commandPath(n *kong.Node) string {
	var words []string
	for ; n != nil && n.Type == kong.CommandNode; n = n.Parent {
		words = append([]string{n.Name}, words...)
	}
	return strings.Join(words, " ")
}

// CheckExamples returns what is wrong with t.Examples for cli, a pointer to
// the tool's kong struct as given to Run: a visible command (or the tool)
// without an example, examples keyed by a command that does not exist, and
// examples that kong does not parse as a use of their command (not starting
// with the tool and that command, an unknown flag, a bad value, a missing
// argument). Each tool's tests call it so that examples stay runnable as
// commands and flags change.
func CheckExamples(t Tool, cli any) []string {
	parser, err := t.parser(cli)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	paths := map[string]bool{}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		path := commandPath(n)
		paths[path] = true
		if len(t.Examples[path]) == 0 {
			problems = append(problems, fmt.Sprintf("%s %q: no example", t.Name, path))
		}
		for _, c := range n.Children {
			if c.Type == kong.CommandNode && !c.Hidden {
				walk(c)
			}
		}
	}
	walk(parser.Model.Node)

	for _, key := range slices.Sorted(maps.Keys(t.Examples)) {
		if !paths[key] {
			problems = append(problems, fmt.Sprintf("%s %q: examples for a command that does not exist", t.Name, key))
			continue
		}
		for _, ex := range t.Examples[key] {
			if err := checkExample(t, cli, key, ex); err != nil {
				problems = append(problems, fmt.Sprintf("%s %q: example %q: %v", t.Name, key, ex, err))
			}
		}
	}
	return problems
}

// checkExample parses each invocation of the tool in one example line with
// kong, as Run would, and checks that the first one runs command key (or a
// subcommand of it). A default command may be left out, as users do.
func checkExample(t Tool, cli any, key, example string) error {
	for i, words := range shellCommands(example) {
		if words[0] != t.Name {
			if i == 0 {
				return fmt.Errorf("does not start with %s", t.Name)
			}
			continue // another program in a pipeline
		}
		// A fresh struct and parser for each: kong's parse state is not
		// meant to be reused, and Parse fills the struct in.
		fresh := reflect.New(reflect.TypeOf(cli).Elem()).Interface()
		parser, err := t.parser(fresh, kong.Exit(func(int) {}), kong.Writers(io.Discard, io.Discard))
		if err != nil {
			return err
		}
		kctx, err := parser.Parse(words[1:])
		if err != nil {
			return err
		}
		if got := commandPath(kctx.Selected()); i == 0 && key != "" && got != key && !strings.HasPrefix(got, key+" ") {
			return fmt.Errorf("runs %q, not %q", got, key)
		}
	}
	return nil
}

// shellCommands splits a one-line shell example into the words of its simple
// commands (split at |, ;, &), honouring quotes. Redirections and comments are
// dropped and nothing is expanded: "$L" stays a placeholder word.
func shellCommands(line string) [][]string {
	var (
		cmds             [][]string
		words            []string
		word             strings.Builder
		inWord, redirect bool
		quote            rune
	)
	endWord := func() {
		if inWord && !redirect {
			words = append(words, word.String())
		}
		if inWord {
			redirect = false
		}
		word.Reset()
		inWord = false
	}
	endCmd := func() {
		endWord()
		if len(words) > 0 {
			cmds = append(cmds, words)
		}
		words = nil
	}
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				word.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			endWord()
		case r == '|' || r == ';' || r == '&':
			endCmd()
		case r == '>' || r == '<':
			endWord()
			redirect = true
		case r == '#' && !inWord:
			endCmd()
			return cmds
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	endCmd()
	return cmds
}
