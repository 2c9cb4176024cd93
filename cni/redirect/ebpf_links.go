package redirect

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/canopy-mesh/canopy/cni/redirect/bpfprog"
	"github.com/canopy-mesh/canopy/internal/netns"
	"github.com/canopy-mesh/canopy/internal/sockmap"
)

// pinnedMaps are a pod's socks and cfg maps, as pinned in its directory.
type pinnedMaps struct {
	socks, cfg *ebpf.Map
}

// openPinnedMaps opens the pinned maps of dir. With create, a missing map
// is created and pinned, and one of another layout (an incompatible
// Canopy version) replaced; without, both are errors, wrapping
// fs.ErrNotExist and ebpf.ErrMapIncompatible.
func openPinnedMaps(dir string, create bool) (*pinnedMaps, error) {
	specs := bpfprog.MapSpecs()
	socks, err := openPinnedMap(filepath.Join(dir, sockmap.MapFile), specs[bpfprog.MapSocks], create)
	if err != nil {
		return nil, err
	}
	cfg, err := openPinnedMap(filepath.Join(dir, ebpfCfgFile), specs[bpfprog.MapCfg], create)
	if err != nil {
		socks.Close()
		return nil, err
	}
	return &pinnedMaps{socks: socks, cfg: cfg}, nil
}

func openPinnedMap(path string, spec *ebpf.MapSpec, create bool) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	switch {
	case err == nil:
		cerr := spec.Compatible(m)
		if cerr == nil {
			return m, nil
		}
		m.Close()
		if !create {
			return nil, fmt.Errorf("pinned map %s: %w", path, cerr)
		}
		// The programs cannot use it; the proxy re-registers in the new
		// one, which it finds by the same path.
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("replace pinned map of another layout: %w", err)
		}
	case errors.Is(err, fs.ErrNotExist):
		if !create {
			return nil, fmt.Errorf("pinned map %s: %w", path, err)
		}
	default:
		return nil, fmt.Errorf("open pinned map %s: %w", path, err)
	}
	m, err = ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("create map %s: %w", spec.Name, err)
	}
	if err := m.Pin(path); err != nil {
		m.Close()
		return nil, fmt.Errorf("pin map %s: %w", path, err)
	}
	return m, nil
}

func (m *pinnedMaps) Close() {
	m.socks.Close()
	m.cfg.Close()
}

// ids are the kernel's IDs of both maps, which a program that uses them
// lists (ebpf.ProgramInfo.MapIDs).
func (m *pinnedMaps) ids() ([]ebpf.MapID, error) {
	var out []ebpf.MapID
	for _, mp := range []*ebpf.Map{m.socks, m.cfg} {
		info, err := mp.Info()
		if err != nil {
			return nil, fmt.Errorf("map info: %w", err)
		}
		id, ok := info.ID()
		if !ok {
			return nil, errors.New("map info: the kernel reports no map ID")
		}
		out = append(out, id)
	}
	return out, nil
}

// ebpfProgs loads the programs against the pod's pinned maps on first use:
// an Enroll that finds Canopy's current programs attached loads nothing.
type ebpfProgs struct {
	maps *pinnedMaps
	coll *ebpf.Collection
}

func (g *ebpfProgs) get(name string) (*ebpf.Program, error) {
	if g.coll == nil {
		coll, err := ebpf.NewCollectionWithOptions(bpfprog.CollectionSpec(), ebpf.CollectionOptions{
			MapReplacements: map[string]*ebpf.Map{bpfprog.MapSocks: g.maps.socks, bpfprog.MapCfg: g.maps.cfg},
		})
		if err != nil {
			return nil, fmt.Errorf("load eBPF programs: %w", err)
		}
		g.coll = coll
	}
	return g.coll.Programs[name], nil
}

// Close releases the loaded programs; the links hold those attached.
func (g *ebpfProgs) Close() {
	if g.coll != nil {
		g.coll.Close()
	}
}

// updateIfStale swaps the program of l for the current one of name
// unless l already runs it against the pinned maps. Link.Update replaces
// it atomically: no lookup or packet goes without a program.
func (g *ebpfProgs) updateIfStale(l link.Link, name string) error {
	info, err := l.Info()
	if err != nil {
		return fmt.Errorf("link info: %w", err)
	}
	ids, err := g.maps.ids()
	if err != nil {
		return err
	}
	cur, err := inspectProg(info.Program, specOf(name), ids)
	if err != nil {
		return err
	}
	if cur.ours && cur.usesMaps {
		return nil
	}
	prog, err := g.get(name)
	if err != nil {
		return err
	}
	if err := l.Update(prog); err != nil {
		return fmt.Errorf("replace program %d with %s: %w", info.Program, name, err)
	}
	return nil
}

func specOf(name string) *ebpf.ProgramSpec {
	if name == bpfprog.ProgInbound {
		return bpfprog.InboundSpec()
	}
	return bpfprog.SkLookupSpec()
}

// progState is what Verify and Enroll want to know of an attached
// program.
type progState struct {
	id       ebpf.ProgramID
	name     string
	ours     bool // runs spec's instructions
	usesMaps bool // and the pod's pinned maps
}

func (s progState) String() string {
	if s.name == "" {
		return fmt.Sprintf("program %d", s.id)
	}
	return fmt.Sprintf("program %d (%s)", s.id, s.name)
}

func inspectProg(id ebpf.ProgramID, spec *ebpf.ProgramSpec, mapIDs []ebpf.MapID) (progState, error) {
	prog, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return progState{}, fmt.Errorf("open program %d: %w", id, err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return progState{}, fmt.Errorf("program %d info: %w", id, err)
	}
	s := progState{id: id, name: info.Name}
	if s.ours, err = bpfprog.IsOurs(spec, info); err != nil {
		return progState{}, err
	}
	if ids, ok := info.MapIDs(); ok && len(mapIDs) > 0 {
		s.usesMaps = sameIDs(ids, mapIDs)
	}
	return s, nil
}

func sameIDs(a, b []ebpf.MapID) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// loadPinnedLink opens the link pinned at path: nil when there is none.
// Something else pinned there (not a link) is removed, and nil returned,
// so that the caller pins a new link in its place.
func loadPinnedLink(path string) (link.Link, error) {
	l, err := link.LoadPinnedLink(path, nil)
	switch {
	case err == nil:
		return l, nil
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	}
	if rerr := os.Remove(path); rerr != nil {
		return nil, fmt.Errorf("open pinned link: %w", errors.Join(err, rerr))
	}
	return nil, nil
}

// dropLink unpins, detaches and closes l. Detaching explicitly makes sure
// the attachment ends even if some process still holds the link.
func dropLink(l link.Link) error {
	defer l.Close()
	var errs []error
	if err := l.Unpin(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("unpin link: %w", err))
	}
	if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ensureSkLookup makes the pinned sk_lookup link attached to the pod's
// namespace and running the current program against the pinned maps.
func (p *ebpfPod) ensureSkLookup(progs *ebpfProgs) error {
	path := filepath.Join(p.dir, ebpfSkLookupFile)
	l, err := loadPinnedLink(path)
	if err != nil {
		return err
	}
	if l != nil {
		attached, err := p.skLookupAttached(l)
		if err != nil {
			l.Close()
			return err
		}
		if attached {
			defer l.Close()
			return progs.updateIfStale(l, bpfprog.ProgSkLookup)
		}
		// Detached by hand, or of an earlier namespace that had the same
		// inode number.
		if err := dropLink(l); err != nil {
			return err
		}
	}
	prog, err := progs.get(bpfprog.ProgSkLookup)
	if err != nil {
		return err
	}
	nsl, err := link.AttachNetNs(int(p.ns.Fd()), prog)
	if err != nil {
		return fmt.Errorf("attach sk_lookup program to %s: %w", p.path, err)
	}
	// Unpinned, the link detaches when closed.
	defer nsl.Close()
	if err := nsl.Pin(path); err != nil {
		return fmt.Errorf("pin sk_lookup link: %w", err)
	}
	return nil
}

// skLookupAttached reports whether l is attached to the pod's namespace.
func (p *ebpfPod) skLookupAttached(l link.Link) (bool, error) {
	info, err := l.Info()
	if err != nil {
		return false, fmt.Errorf("sk_lookup link info: %w", err)
	}
	if ns := info.NetNs(); ns == nil || uint64(ns.NetnsInode) != p.ino {
		return false, nil
	}
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(p.ns.Fd()), Attach: ebpf.AttachSkLookup})
	if err != nil {
		return false, fmt.Errorf("query sk_lookup programs of %s: %w", p.path, err)
	}
	return slices.ContainsFunc(res.Programs, func(ap link.AttachedProgram) bool { return ap.ID == info.Program }), nil
}

// pinnedTCXFiles lists the tcx link pins of dir.
func pinnedTCXFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var out []string
	for _, e := range entries {
		if n := e.Name(); strings.HasPrefix(n, ebpfTCXPrefix) && strings.HasSuffix(n, ebpfLinkSuffix) {
			out = append(out, n)
		}
	}
	return out, nil
}

// ensureTCX attaches the inbound program to every interface of the pod but
// lo, pinned per interface, and removes the links of interfaces gone.
// Interface indexes resolve in the calling thread's namespace, so
// attaching happens on a thread inside the pod's.
func (p *ebpfPod) ensureTCX(progs *ebpfProgs) error {
	ifaces, err := podInterfaces(p.h)
	if err != nil {
		return err
	}
	want := map[string]int{}
	for _, l := range ifaces {
		want[tcxLinkFile(l.Attrs().Name)] = l.Attrs().Index
	}
	files, err := pinnedTCXFiles(p.dir)
	if err != nil {
		return err
	}
	for _, f := range files {
		if _, ok := want[f]; ok {
			continue
		}
		if err := removePinnedLink(filepath.Join(p.dir, f)); err != nil {
			return err
		}
	}
	return netns.Do(p.path, func() error {
		for _, l := range ifaces {
			file := tcxLinkFile(l.Attrs().Name)
			if err := ensureOneTCX(filepath.Join(p.dir, file), l.Attrs().Name, l.Attrs().Index, progs); err != nil {
				return err
			}
		}
		return nil
	})
}

// ensureOneTCX makes the link pinned at path attached to ingress of the
// interface ifindex (of the calling thread's namespace), first in its
// chain, running the current program.
func ensureOneTCX(path, ifname string, ifindex int, progs *ebpfProgs) error {
	l, err := loadPinnedLink(path)
	if err != nil {
		return err
	}
	if l != nil {
		attached, err := tcxAttached(l, ifindex)
		if err != nil {
			l.Close()
			return err
		}
		if attached {
			defer l.Close()
			return progs.updateIfStale(l, bpfprog.ProgInbound)
		}
		if err := dropLink(l); err != nil {
			return err
		}
	}
	prog, err := progs.get(bpfprog.ProgInbound)
	if err != nil {
		return err
	}
	tl, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress, Anchor: link.Head()})
	if err != nil {
		return fmt.Errorf("attach inbound program to %s: %w", ifname, err)
	}
	defer tl.Close()
	if err := tl.Pin(path); err != nil {
		return fmt.Errorf("pin tcx link of %s: %w", ifname, err)
	}
	return nil
}

// tcxAttached reports whether l is attached to ingress of ifindex in the
// calling thread's namespace.
func tcxAttached(l link.Link, ifindex int) (bool, error) {
	info, err := l.Info()
	if err != nil {
		return false, fmt.Errorf("tcx link info: %w", err)
	}
	if t := info.TCX(); t == nil || int(t.Ifindex) != ifindex {
		return false, nil
	}
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return false, fmt.Errorf("query tcx programs of interface %d: %w", ifindex, err)
	}
	return slices.ContainsFunc(res.Programs, func(ap link.AttachedProgram) bool {
		id, ok := ap.LinkID()
		return ok && id == info.ID
	}), nil
}

// removePinnedLink detaches and unpins the link pinned at path; nothing
// there is fine.
func removePinnedLink(path string) error {
	l, err := loadPinnedLink(path)
	if err != nil || l == nil {
		return err
	}
	return dropLink(l)
}

// removePinDir detaches the links pinned in dir and removes it; a missing
// dir is fine.
func removePinDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ebpfLinkSuffix) {
			errs = append(errs, removePinnedLink(filepath.Join(dir, e.Name())))
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// RemoveStaleDirs removes the pin directories under Root whose network
// namespace inode is not in live (the namespaces of the pods the agent
// knows, those it is enrolling included), detaching their links, and
// returns their inodes. It is for pods that went away while no agent ran,
// whose Unenroll never came.
//
// A directory whose sk_lookup link is still attached to a living
// namespace is kept whatever live says: removing it would detach the
// programs of a pod that is still running and let its traffic around the
// proxy. (The kernel detaches a namespace's links when the namespace goes
// away, so a pod that is gone never holds its directory.) Entries whose
// names are not inode numbers are left alone.
func (e Ebpf) RemoveStaleDirs(live []uint64) ([]uint64, error) {
	root := e.root()
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", root, err)
	}
	var removed []uint64
	var errs []error
	for _, ent := range entries {
		ino, err := strconv.ParseUint(ent.Name(), 10, 64)
		if err != nil || !ent.IsDir() || slices.Contains(live, ino) {
			continue
		}
		dir := filepath.Join(root, ent.Name())
		if attachedToLiveNetns(dir) {
			continue
		}
		if err := removePinDir(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, ino)
	}
	return removed, errors.Join(errs...)
}

// attachedToLiveNetns reports whether the sk_lookup link pinned in dir is
// attached to a namespace: the kernel reports inode 0 for a link whose
// namespace is gone or that was detached.
func attachedToLiveNetns(dir string) bool {
	l, err := link.LoadPinnedLink(filepath.Join(dir, ebpfSkLookupFile), nil)
	if err != nil {
		return false
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return false
	}
	ns := info.NetNs()
	return ns != nil && ns.NetnsInode != 0
}

// skLookupProblems describes how the sk_lookup programs of the pod's
// namespace differ from one of Canopy's, through the pinned link, using
// the maps mapIDs (want), or from none of Canopy's (!want).
func (p *ebpfPod) skLookupProblems(mapIDs []ebpf.MapID, want bool) ([]string, error) {
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(p.ns.Fd()), Attach: ebpf.AttachSkLookup})
	if err != nil {
		return nil, fmt.Errorf("query sk_lookup programs of %s: %w", p.path, err)
	}
	var problems []string
	ours := 0
	for _, ap := range res.Programs {
		s, err := inspectProg(ap.ID, bpfprog.SkLookupSpec(), mapIDs)
		if err != nil {
			return nil, err
		}
		switch {
		case !s.ours:
			problems = append(problems, fmt.Sprintf("sk_lookup %s attached to the pod's network namespace is not Canopy's", s))
		case !want:
			problems = append(problems, fmt.Sprintf("Canopy's sk_lookup %s is attached to the pod's network namespace", s))
		case !s.usesMaps:
			ours++
			problems = append(problems, fmt.Sprintf("sk_lookup %s does not use the pod's pinned maps", s))
		default:
			ours++
		}
	}
	if !want {
		return problems, nil
	}
	switch {
	case ours == 0:
		problems = append(problems, "no sk_lookup program attached to the pod's network namespace: outbound TCP and DNS do not reach the node proxy")
	case ours > 1:
		problems = append(problems, fmt.Sprintf("%d Canopy sk_lookup programs attached to the pod's network namespace, want 1", ours))
	}
	path := filepath.Join(p.dir, ebpfSkLookupFile)
	l, err := link.LoadPinnedLink(path, nil)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		problems = append(problems, fmt.Sprintf("pinned link %s missing", path))
	case err != nil:
		problems = append(problems, fmt.Sprintf("pinned link %s: %v", path, err))
	default:
		defer l.Close()
		attached, err := p.skLookupAttached(l)
		if err != nil {
			return nil, err
		}
		if !attached {
			problems = append(problems, fmt.Sprintf("pinned link %s is not attached to the pod's network namespace", path))
		}
	}
	return problems, nil
}

// tcxProblems describes how the tcx ingress programs of the pod's
// interfaces differ from one of Canopy's per interface but lo, through
// its pinned link, using the maps mapIDs (want), or from none of
// Canopy's (!want).
func (p *ebpfPod) tcxProblems(mapIDs []ebpf.MapID, want bool) ([]string, error) {
	ifaces, err := podInterfaces(p.h)
	if err != nil {
		return nil, err
	}
	files, err := pinnedTCXFiles(p.dir)
	if err != nil {
		return nil, err
	}
	var problems []string
	err = netns.Do(p.path, func() error {
		for _, l := range ifaces {
			name, index := l.Attrs().Name, l.Attrs().Index
			res, err := link.QueryPrograms(link.QueryOptions{Target: index, Attach: ebpf.AttachTCXIngress})
			if err != nil {
				return fmt.Errorf("query tcx programs of %s: %w", name, err)
			}
			ours := 0
			for _, ap := range res.Programs {
				s, err := inspectProg(ap.ID, bpfprog.InboundSpec(), mapIDs)
				if err != nil {
					return err
				}
				switch {
				case !s.ours:
					problems = append(problems, fmt.Sprintf("interface %s: tcx ingress %s is not Canopy's", name, s))
				case !want:
					problems = append(problems, fmt.Sprintf("interface %s: Canopy's inbound %s is attached to a pod the nftables backend captures", name, s))
				case !s.usesMaps:
					ours++
					problems = append(problems, fmt.Sprintf("interface %s: inbound %s does not use the pod's pinned maps", name, s))
				default:
					ours++
				}
			}
			if !want {
				continue
			}
			switch {
			case ours == 0:
				problems = append(problems, fmt.Sprintf("interface %s: no inbound program attached: inbound TCP does not reach the node proxy's 15006", name))
			case ours > 1:
				problems = append(problems, fmt.Sprintf("interface %s: %d Canopy inbound programs attached, want 1", name, ours))
			}
			file := tcxLinkFile(name)
			files = slices.DeleteFunc(files, func(f string) bool { return f == file })
			path := filepath.Join(p.dir, file)
			pl, err := link.LoadPinnedLink(path, nil)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				problems = append(problems, fmt.Sprintf("pinned link %s missing", path))
			case err != nil:
				problems = append(problems, fmt.Sprintf("pinned link %s: %v", path, err))
			default:
				attached, err := tcxAttached(pl, index)
				pl.Close()
				if err != nil {
					return err
				}
				if !attached {
					problems = append(problems, fmt.Sprintf("pinned link %s is not attached to %s", path, name))
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		problems = append(problems, fmt.Sprintf("unexpected pinned link %s (no such interface)", filepath.Join(p.dir, f)))
	}
	return problems, nil
}
