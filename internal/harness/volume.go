package harness

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"
)

// Volume is a directory laid out as the kubelet lays out a ConfigMap (or
// projected) volume, and updated as its AtomicWriter updates it:
//
//	..2026_11_22_10_00_00.000000001/KEY   the data, one file a key
//	..data -> ..2026_11_22_10_00_00.000000001   swapped atomically (rename)
//	KEY -> ..data/KEY                     what the agent opens
type Volume struct {
	Dir   string
	files map[string]string // every key's content as of the last update
	n     int
}

// NewVolume lays files (key: content) out in dir, which exists.
func NewVolume(dir string, files map[string]string) (*Volume, error) {
	v := &Volume{Dir: dir, files: map[string]string{}}
	_, err := v.Update(files)
	return v, err
}

// Path is the path of key, as the agent is given it.
func (v *Volume) Path(key string) string { return filepath.Join(v.Dir, key) }

// Update writes every key, with files' new contents, to a new timestamped
// directory and swaps ..data to it. It returns the time of the swap (just
// before the rename).
func (v *Volume) Update(files map[string]string) (time.Time, error) {
	maps.Copy(v.files, files)
	return v.swap(func(string, string) error { return nil })
}

// Place is Update with key put in the new directory by place(path) (a
// symlink, a fifo, a file too large ...) instead of written.
func (v *Volume) Place(key string, place func(path string) error) (time.Time, error) {
	v.files[key] = ""
	return v.swap(func(k, path string) error {
		if k != key {
			return nil
		}
		if err := os.Remove(path); err != nil {
			return err
		}
		return place(path)
	})
}

// swap writes the files to a new directory, lets override change each,
// and swaps ..data to it; the keys' symlinks are made then, and the old
// directory removed, as the kubelet does.
func (v *Volume) swap(override func(key, path string) error) (time.Time, error) {
	v.n++
	ts := time.Now().UTC().Format("..2006_01_02_15_04_05.") + fmt.Sprintf("%09d", v.n)
	dir := filepath.Join(v.Dir, ts)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return time.Time{}, err
	}
	// Whatever the umask: the agent in a container may read it as
	// another user.
	if err := os.Chmod(dir, 0o755); err != nil {
		return time.Time{}, err
	}
	for k, content := range v.files {
		path := filepath.Join(dir, k)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return time.Time{}, err
		}
		if err := override(k, path); err != nil {
			return time.Time{}, err
		}
	}
	data := filepath.Join(v.Dir, "..data")
	old, _ := os.Readlink(data)
	tmp := filepath.Join(v.Dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		return time.Time{}, err
	}
	at := time.Now()
	if err := os.Rename(tmp, data); err != nil { // rename(2): atomic
		return time.Time{}, err
	}
	for k := range v.files {
		if _, err := os.Lstat(v.Path(k)); errors.Is(err, os.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", k), v.Path(k)); err != nil {
				return time.Time{}, err
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.Dir, old)); err != nil {
			return time.Time{}, err
		}
	}
	return at, nil
}
