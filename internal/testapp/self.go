package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// selfView is what /self tells of the process and its container: the
// isolation tests read a sandbox's identity, capabilities and limits from
// inside it.
type selfView struct {
	UID int `json:"uid"`
	GID int `json:"gid"`
	// CapEff and CapBnd are the effective and bounding capability sets,
	// as /proc/self/status shows them (hex).
	CapEff string `json:"cap_eff"`
	CapBnd string `json:"cap_bnd"`
	// NoNewPrivs is the no_new_privs bit.
	NoNewPrivs string `json:"no_new_privs"`
	// Seccomp is the seccomp mode (0 none, 2 filter).
	Seccomp string `json:"seccomp"`
	// NofileSoft and NofileHard are RLIMIT_NOFILE.
	NofileSoft uint64 `json:"nofile_soft"`
	NofileHard uint64 `json:"nofile_hard"`
	// RootWrite is the error of creating a file in / ("" when it worked).
	RootWrite string `json:"root_write"`
	// TmpWrite is the same in /tmp; TmpBytes the size of /tmp's
	// filesystem.
	TmpWrite string `json:"tmp_write"`
	TmpBytes uint64 `json:"tmp_bytes"`
}

// selfHandler serves /self.
func selfHandler(w http.ResponseWriter, _ *http.Request) {
	v := selfView{UID: os.Getuid(), GID: os.Getgid()}
	if f, err := os.Open("/proc/self/status"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, val, _ := strings.Cut(sc.Text(), ":")
			val = strings.TrimSpace(val)
			switch k {
			case "CapEff":
				v.CapEff = val
			case "CapBnd":
				v.CapBnd = val
			case "NoNewPrivs":
				v.NoNewPrivs = val
			case "Seccomp":
				v.Seccomp = val
			}
		}
		f.Close()
	}
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		v.NofileSoft, v.NofileHard = lim.Cur, lim.Max
	}
	v.RootWrite = tryWrite("/.sandwake-self")
	v.TmpWrite = tryWrite("/tmp/.sandwake-self")
	var st syscall.Statfs_t
	if syscall.Statfs("/tmp", &st) == nil {
		v.TmpBytes = st.Blocks * uint64(st.Bsize)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// tryWrite creates and removes a file at p; "" when both worked.
func tryWrite(p string) string {
	f, err := os.Create(p)
	if err != nil {
		return err.Error()
	}
	f.Close()
	os.Remove(p)
	return ""
}

// fillHandler serves /fill?path=<file>&mb=<n>: it writes n MiB of
// non-zero bytes (not sparse: they take disk) to path, an absolute path
// in the container; the disk-quota tests fill a sandbox's workspace or
// writable layer with it.
func fillHandler(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	mb, err := strconv.Atoi(r.URL.Query().Get("mb"))
	if !strings.HasPrefix(p, "/") || err != nil || mb < 1 || mb > 4096 {
		http.Error(w, "want ?path=/abs/file&mb=1..4096", http.StatusBadRequest)
		return
	}
	f, err := os.Create(p)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*7 + 1)
	}
	for range mb {
		if _, err := f.Write(chunk); err != nil {
			f.Close()
			http.Error(w, err.Error(), http.StatusInsufficientStorage)
			return
		}
	}
	if err := f.Close(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	fmt.Fprintf(w, "wrote %d MiB to %s\n", mb, p)
}
