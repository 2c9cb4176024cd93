package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/canopy-mesh/canopy/internal/ociimage"
)

// iptablesMulti is the multi-call binary of Debian's iptables package
// (nftables variant), and iptablesCommands the names the CNI agent's
// iptables backend runs it by.
const iptablesMulti = "/usr/sbin/xtables-nft-multi"

var iptablesCommands = []string{"iptables", "iptables-restore", "iptables-save", "ip6tables", "ip6tables-restore", "ip6tables-save"}

// multiarch is Debian's library directory name for a GOARCH, and machine
// the ELF machine of its programs.
var (
	multiarch = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
	machine   = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
)

// iptablesFiles are what the CNI agent's image needs to run iptables: the
// multi-call binary from the build machine's Debian iptables package under
// each command name, its extensions (the matches and targets a rule names
// are loaded at run time), and every shared library they need with the
// dynamic loader, each at the path the loader looks for it. root is the
// file system to take them from ("/", or a test's tree).
func iptablesFiles(root, goarch string) ([]ociimage.File, error) {
	triplet, ok := multiarch[goarch]
	if !ok {
		return nil, fmt.Errorf("no Debian multiarch directory known for %s", goarch)
	}
	libDir := "/usr/lib/" + triplet
	// The build machine's iptables is the image's: an image for another
	// architecture cannot take it.
	f, err := elf.Open(filepath.Join(root, iptablesMulti))
	if err != nil {
		return nil, fmt.Errorf("iptables (is Debian's iptables installed? hack/install-deps.sh): %w", err)
	}
	m := f.Machine
	f.Close()
	if m != machine[goarch] {
		return nil, fmt.Errorf("%s is for %s, the image for %s: build it on a %s machine", iptablesMulti, m, goarch, goarch)
	}
	files := []ociimage.File{{Path: iptablesMulti, Source: filepath.Join(root, iptablesMulti), Mode: 0o755}}
	for _, c := range iptablesCommands {
		files = append(files, ociimage.File{Path: "/usr/sbin/" + c, Link: path.Base(iptablesMulti)})
	}
	extDir := libDir + "/xtables"
	exts, err := os.ReadDir(filepath.Join(root, extDir))
	if err != nil {
		return nil, fmt.Errorf("iptables extensions (is Debian's iptables installed? hack/install-deps.sh): %w", err)
	}
	elves := []string{iptablesMulti}
	for _, e := range exts {
		if strings.HasSuffix(e.Name(), ".so") {
			p := extDir + "/" + e.Name()
			files = append(files, ociimage.File{Path: p, Source: filepath.Join(root, p), Mode: 0o644})
			elves = append(elves, p)
		}
	}
	libs, err := sharedLibraries(root, libDir, elves)
	if err != nil {
		return nil, err
	}
	for _, l := range libs {
		files = append(files, ociimage.File{Path: l, Source: filepath.Join(root, l), Mode: 0o755})
	}
	return files, nil
}

// sharedLibraries follows the DT_NEEDED entries of elves, and of what they
// need, to their files (in libDir, where Debian keeps them; the host path
// may be a link, which the image replaces with the file itself), plus the
// dynamic loader each names. Sorted, each once.
func sharedLibraries(root, libDir string, elves []string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	queue := slices.Clone(elves)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		f, err := elf.Open(filepath.Join(root, p))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		needed, err := f.ImportedLibraries()
		interp := interpreter(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("libraries of %s: %w", p, err)
		}
		if interp != "" && !seen[interp] {
			seen[interp] = true
			out = append(out, interp)
		}
		for _, n := range needed {
			lib := libDir + "/" + n
			if seen[lib] {
				continue
			}
			if _, err := os.Stat(filepath.Join(root, lib)); errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("%s needs %s, which is not in %s", p, n, libDir)
			}
			seen[lib] = true
			out = append(out, lib)
			queue = append(queue, lib)
		}
	}
	slices.Sort(out)
	return out, nil
}

// interpreter is the dynamic loader an executable names (PT_INTERP).
func interpreter(f *elf.File) string {
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return ""
			}
			return strings.TrimRight(string(b), "\x00")
		}
	}
	return ""
}
