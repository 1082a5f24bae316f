package lifecycle

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// HostMemAvailable reports the memory available to new sandboxes, in bytes:
// MemAvailable from /proc/meminfo, or, when sandwake itself runs in a
// memory-limited cgroup (v2), the smaller of that and the cgroup's headroom.
func HostMemAvailable() (uint64, error) {
	avail, err := procMemAvailable("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	if head, ok := cgroupHeadroom("/sys/fs/cgroup"); ok && head < avail {
		return head, nil
	}
	return avail, nil
}

// HostMemTotal reports the host's total memory in bytes (MemTotal).
func HostMemTotal() (uint64, error) { return meminfoField("/proc/meminfo", "MemTotal:") }

func procMemAvailable(path string) (uint64, error) { return meminfoField(path, "MemAvailable:") }

func meminfoField(path, field string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading memory: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, field) {
			continue
		}
		f := strings.Fields(line[len(field):])
		if len(f) == 0 {
			break
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("reading memory: %s %q: %w", field, f[0], err)
		}
		return kb * 1024, nil
	}
	return 0, errors.New("reading memory: no " + field + " in " + path)
}

// cgroupHeadroom is memory.max - memory.current of the cgroup v2 at dir, if
// it has a limit.
func cgroupHeadroom(dir string) (uint64, bool) {
	max, err := readUint(dir + "/memory.max")
	if err != nil {
		return 0, false // "max" (no limit) or no cgroup v2
	}
	cur, err := readUint(dir + "/memory.current")
	if err != nil || cur > max {
		return 0, err == nil
	}
	return max - cur, true
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}
