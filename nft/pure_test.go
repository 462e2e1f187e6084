package nft

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// nft is pure: the model, the plan, the codec, the evaluator and the
// fake. The netfilter socket is nft/kernel's alone; nothing here opens a
// socket or a file. (syscall and x/sys/unix are used for errno values and
// constants: the fake refuses as the kernel does.)
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
