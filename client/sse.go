package client

import (
	"bufio"
	"io"
	"strconv"
	"strings"
	"time"
)

// Message is one message of a server-sent event stream. The API sends an
// Event as JSON in Data, with its id as ID.
type Message struct {
	ID   string
	Data string
}

// ReadSSE reads a text/event-stream until it ends, calling emit for each
// message that carries data, and retry, when not nil, with the value of
// each "retry:" field. Comment lines (":…", the API's keep-alives) are
// skipped; so are fields other than id, data and retry. An error from emit
// ends the read and is answered.
func ReadSSE(r io.Reader, emit func(Message) error, retry func(time.Duration)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	var m Message
	var data []string
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if line == "" {
			if data != nil {
				m.Data = strings.Join(data, "\n")
				if err := emit(m); err != nil {
					return err
				}
			}
			m, data = Message{}, nil
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			m.ID = value
		case "data":
			data = append(data, value)
		case "retry":
			if ms, err := strconv.Atoi(value); err == nil && ms >= 0 && retry != nil {
				retry(time.Duration(ms) * time.Millisecond)
			}
		}
	}
	return sc.Err()
}
