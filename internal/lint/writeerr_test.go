// Package lint holds checks of the source tree that go vet does not make.
package lint

import (
	"go/ast"
	"go/types"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// TestWriteErrorsChecked fails for a discarded error of a write to a
// record stream: any Flush() error, and records.Writer's Write and Line.
// A tool whose stdout is a pipe learns that the reader went away, or that
// the disk filled, only from these errors; dropping them (a bare call, or
// "defer w.Flush()") turns a truncated JSON-lines stream into exit 0.
func TestWriteErrorsChecked(t *testing.T) {
	cfg := &packages.Config{
		Mode:       packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo,
		Dir:        "../..",
		BuildFlags: []string{"-tags", "talkboxtest"},
	}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		t.Fatal(err)
	}
	if packages.PrintErrors(pkgs) > 0 {
		t.Fatal("the tree does not type-check")
	}
	var found []string
	for _, p := range pkgs {
		for _, f := range p.Syntax {
			name := p.Fset.File(f.Pos()).Name()
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			ast.Inspect(f, func(n ast.Node) bool {
				var call *ast.CallExpr
				switch s := n.(type) {
				case *ast.ExprStmt:
					call, _ = s.X.(*ast.CallExpr)
				case *ast.DeferStmt:
					call = s.Call
				case *ast.GoStmt:
					call = s.Call
				}
				if call != nil && discardsWriteError(p.TypesInfo, call) {
					found = append(found, p.Fset.Position(call.Pos()).String())
				}
				return true
			})
		}
	}
	if len(found) > 0 {
		t.Errorf("write errors discarded (return or check them):\n%s", strings.Join(found, "\n"))
	}
}

// discardsWriteError reports whether call is one of the checked writes.
func discardsWriteError(info *types.Info, call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	fn, ok := info.Uses[sel.Sel].(*types.Func)
	if !ok {
		return false
	}
	sig := fn.Type().(*types.Signature)
	if sig.Recv() == nil || sig.Results().Len() != 1 || !isError(sig.Results().At(0).Type()) {
		return false
	}
	switch fn.Name() {
	case "Flush":
		return sig.Params().Len() == 0
	case "Write", "Line":
		return recvIs(sig.Recv().Type(), "internal/records", "Writer")
	}
	return false
}

func isError(t types.Type) bool {
	return types.Identical(t, types.Universe.Lookup("error").Type())
}

func recvIs(t types.Type, pkgSuffix, name string) bool {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	if !ok || n.Obj().Pkg() == nil {
		return false
	}
	return n.Obj().Name() == name && strings.HasSuffix(n.Obj().Pkg().Path(), pkgSuffix)
}
