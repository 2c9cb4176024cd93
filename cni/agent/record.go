package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/canopy-mesh/canopy/internal/atomicfile"
)

// netnsRecord is what the agent keeps on the node of a pod's CNI ADD: the
// network namespace the container runtime set the pod up in. It outlives
// an agent restart, which then finds the pod's namespace by the pod's
// identity rather than by its IP.
type netnsRecord struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
	// Netns is the path the runtime gave; Dev and Ino identify the
	// namespace it named at the ADD.
	Netns string `json:"netns"`
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
}

// records keeps one file per pod, <dir>/<uid>.json, each written
// atomically, so that no lock is needed beyond the pod's own. An empty dir
// keeps nothing.
type records struct {
	dir string
}

// recordsDir is where records live under the agent's state directory.
const recordsDir = "pods"

func (r records) path(uid types.UID) (string, error) {
	if !isUID(string(uid)) {
		return "", fmt.Errorf("pod uid %q is not a UID", uid)
	}
	return filepath.Join(r.dir, string(uid)+".json"), nil
}

// save records a pod's ADD.
func (r records) save(rec netnsRecord) error {
	if r.dir == "" {
		return nil
	}
	path, err := r.path(rec.UID)
	if err != nil {
		return err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", r.dir, err)
	}
	return atomicfile.Write(path, b, 0o600)
}

// load returns a pod's record, if there is one.
func (r records) load(uid types.UID) (netnsRecord, bool, error) {
	if r.dir == "" {
		return netnsRecord{}, false, nil
	}
	path, err := r.path(uid)
	if err != nil {
		return netnsRecord{}, false, err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return netnsRecord{}, false, nil
	}
	if err != nil {
		return netnsRecord{}, false, err
	}
	var rec netnsRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.UID != uid {
		return netnsRecord{}, false, fmt.Errorf("record %s is damaged", path)
	}
	return rec, true, nil
}

// remove forgets a pod; a missing record is fine.
func (r records) remove(uid types.UID) error {
	if r.dir == "" {
		return nil
	}
	path, err := r.path(uid)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// older lists the UIDs of records written before t.
func (r records) older(t time.Time) ([]types.UID, error) {
	if r.dir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(r.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []types.UID
	for _, e := range entries {
		uid, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !isUID(uid) {
			continue
		}
		if info, err := e.Info(); err == nil && info.ModTime().Before(t) {
			out = append(out, types.UID(uid))
		}
	}
	return out, nil
}

// clear removes every record (uninstall).
func (r records) clear() error {
	if r.dir == "" {
		return nil
	}
	return os.RemoveAll(r.dir)
}

// openRecorded opens the recorded namespace if it is still the one the
// runtime gave and holds ip.
func openRecorded(rec netnsRecord, ip netip.Addr) (*os.File, error) {
	f, err := openIdentified(rec.Netns, rec.Dev, rec.Ino)
	if err != nil {
		return nil, err
	}
	if !holdsFd(f, ip) {
		f.Close()
		return nil, fmt.Errorf("the namespace at %s no longer holds the pod's IP %s", rec.Netns, ip)
	}
	return f, nil
}
