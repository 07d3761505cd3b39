package state

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// A merge reads, for each stored record it updates, what a dead or finished
// writer may have left of it: the key's own file (Lookup), the record's put
// and delete intents, its own file, and the pack lines naming its copy
// (Update), a system call each, for a record that nearly always has only a
// pack's copy. A writer of a key or record holds its lock, so once the
// batch holds that lock none of these change but by the batch; anything
// read after the lock was taken is true until the commit. A batchView is
// such a reading, made once for many locks: the intents/ directory read
// whole, and the directories of loose records and key files and the pack
// and partition lines read on first use. It serves the keys and records
// whose locks the batch took before it was made, which is why a --merge
// locks all its keys, then looks them up, then locks all their records,
// then updates them (TryLockRecords); a lock taken after it is served the
// ordinary way, or by a new view once viewMin such locks have been taken.
type batchView struct {
	// seq is the number of the last lock the batch had taken when the
	// view was made: it serves locks up to it.
	seq int64
	// intents are the names in intents/.
	intents map[string]bool
	// stats tells the loose records and the key files.
	stats dirStats
	// read: the kinds' pack lines and the indexes' partition lines read
	// since the view was made.
	read map[string]bool
	// recordDirs are the kinds' directories of loose records.
	recordDirs map[string]string
}

// viewMin is how many locks a batch takes after its view (or before its
// first) before a lookup of one of them makes a new view: a view costs a
// few system calls more than one record's reads.
const viewMin = 8

// servedByView tells whether what k guards may be read through the view,
// making a new one if enough locks were taken since the last.
func (b *dirBatch) servedByView(k heldLock) (bool, error) {
	seq := b.lockSeq[k]
	if seq == 0 {
		return false, nil
	}
	if b.view != nil && seq <= b.view.seq {
		return true, nil
	}
	since := b.seq
	if b.view != nil {
		since -= b.view.seq
	}
	if since < viewMin {
		return false, nil
	}
	return true, b.newView()
}

func (b *dirBatch) newView() error {
	b.dropView()
	v := &batchView{seq: b.seq, intents: map[string]bool{}, read: map[string]bool{}, recordDirs: map[string]string{}}
	ents, err := os.ReadDir(filepath.Join(b.s.root, "intents"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, e := range ents {
		v.intents[e.Name()] = true
	}
	b.view = v
	return nil
}

func (b *dirBatch) dropView() {
	if b.view != nil {
		b.view.stats.close()
		b.view = nil
	}
}

// viewIndexEntry is indexEntry for a key the view serves.
func (b *dirBatch) viewIndexEntry(name, key string) (string, bool, error) {
	s, v := b.s, b.view
	path, err := s.indexPath(name, key)
	if err != nil {
		return "", false, err
	}
	own, err := v.stats.exists(filepath.Dir(path), key)
	if err != nil {
		return "", false, err
	}
	if own {
		data, err := readFile(path)
		if err != nil {
			return "", false, err
		}
		return strings.TrimSpace(string(data)), true, nil
	}
	fresh := v.read["index/"+name]
	v.read["index/"+name] = true
	return s.lookupPackedAsOf(name, key, fresh)
}

// viewReadStored settles a dead writer's intents for a record the view
// serves and reads it, as resolveIntent and readStored do.
func (b *dirBatch) viewReadStored(kind, id string) (data []byte, loose bool, err error) {
	s, v := b.s, b.view
	// The names in intents/ and in the records' directory, without a path
	// joined for each record.
	if len(v.intents) > 0 && (v.intents[intentName(kind, id, putIntentSuffix)] || v.intents[intentName(kind, id, deleteIntentSuffix)]) {
		if err := s.resolveIntent(kind, id); err != nil {
			return nil, false, err
		}
		return s.readStored(kind, id)
	}
	dir, ok := v.recordDirs[kind]
	if !ok {
		dir = filepath.Dir(s.recordPath(kind, id))
		v.recordDirs[kind] = dir
	}
	own, err := v.stats.exists(dir, id+".json")
	if err != nil {
		return nil, false, err
	}
	if own {
		data, err := readFile(s.recordPath(kind, id))
		return data, err == nil, err
	}
	fresh := v.read["packs/"+kind]
	v.read["packs/"+kind] = true
	loc, ok, err := s.packedAsOf(kind, id, fresh)
	if err != nil {
		return nil, false, err
	}
	if !ok {
		return nil, false, fs.ErrNotExist
	}
	data, err = s.readPacked(loc)
	return data, false, err
}
