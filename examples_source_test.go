package dlock_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"testing"
)

// TestExamplesEndRequestsWithTheirContext: every go-redis client an Example
// makes sets ContextTimeoutEnabled, as the README and the package docs say
// to (without it a request outlives its context, and a server that hangs
// holds up refreshes and clean-ups).
func TestExamplesEndRequestsWithTheirContext(t *testing.T) {
	files, err := filepath.Glob("example*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example files: %v", err)
	}
	fset := token.NewFileSet()
	seen := 0
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, _ := lit.Type.(*ast.SelectorExpr)
			if sel == nil || sel.Sel.Name != "Options" {
				return true
			}
			if pkg, _ := sel.X.(*ast.Ident); pkg == nil || pkg.Name != "redis" {
				return true
			}
			seen++
			for _, e := range lit.Elts {
				kv, _ := e.(*ast.KeyValueExpr)
				if kv == nil {
					continue
				}
				k, _ := kv.Key.(*ast.Ident)
				v, _ := kv.Value.(*ast.Ident)
				if k != nil && v != nil && k.Name == "ContextTimeoutEnabled" && v.Name == "true" {
					return true
				}
			}
			t.Errorf("%s: redis.Options without ContextTimeoutEnabled: true", fset.Position(lit.Pos()))
			return true
		})
	}
	if seen == 0 {
		t.Error("no redis.Options found in the examples")
	}
}
