package nft

import (
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// nft is pure: the model, the plan, the codec, the evaluator and the
// fake. The netfilter socket is nft/kernel's alone. What this checks:
//
//   - no file of nft imports a package that opens sockets or files or
//     runs commands (syscall and x/sys/unix are allowed: nft uses them
//     for errno values and constants, the fake refusing as the kernel
//     does);
//   - among nft's dependencies, the netlink socket packages (mdlayher/*,
//     vishvananda/*, and github.com/google/nftables itself, whose Conn
//     talks netlink) are reached only through github.com/google/nftables/expr,
//     the expression types the codec encodes, decodes and evaluates: expr
//     imports mdlayher/netlink for its attribute encoder, and with it
//     mdlayher/socket. They are linked in; nft opens no socket with them.
//
// The standard library's net and os are linked in too, as most programs'
// are (netipx and fmt import them): only a direct import is refused.
func TestNoKernelIO(t *testing.T) {
	forbidden := []string{"github.com/google/nftables", "github.com/mdlayher/netlink", "github.com/vishvananda/netlink",
		"github.com/vishvananda/netns", "os", "os/exec", "net", "net/http", "runtime", "io/fs"}
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		ast, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range ast.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, no := range forbidden {
				if path == no {
					t.Errorf("%s imports %s: kernel I/O belongs in nft/kernel", f, path)
				}
			}
		}
	}
}

func TestNoSocketPackagesButThroughExpr(t *testing.T) {
	const carrier = "github.com/google/nftables/expr" // the only allowed way to the socket packages
	socket := func(p string) bool {
		return p == "github.com/google/nftables" || strings.HasPrefix(p, "github.com/mdlayher/") || strings.HasPrefix(p, "github.com/vishvananda/")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the dependencies with")
	}
	out, err := exec.Command(goCmd, "list", "-deps", "-f", `{{.ImportPath}}:{{join .Imports " "}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := map[string][]string{}
	self := ""
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imps, _ := strings.Cut(line, ":")
		imports[pkg], self = strings.Fields(imps), pkg // -deps lists the package itself last
	}
	if !strings.HasSuffix(self, "/nft") {
		t.Fatalf("go list listed %q last, not nft", self)
	}
	// Walk nft's dependencies without entering the carrier.
	via := map[string]string{self: ""} // a package -> the package that imports it on the way
	queue := []string{self}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, q := range imports[p] {
			if _, seen := via[q]; seen || q == carrier {
				continue
			}
			via[q] = p
			queue = append(queue, q)
			if socket(q) {
				chain := []string{q}
				for x := p; x != ""; x = via[x] {
					chain = append(chain, x)
				}
				t.Errorf("nft reaches %s other than through %s: %s", q, carrier, strings.Join(chain, " <- "))
			}
		}
	}
}
