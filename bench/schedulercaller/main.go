// Command schedulercaller calls a scheduler extender the way kube-scheduler does
// (Go's net/http with keep-alive, encoding/json, the extender/v1 shapes without json
// tags) and times each pod's filter and prioritize, for bench/extender_bench.py.
//
// Usage: schedulercaller URL_PREFIX NAMES_JSON PODS_JSONL
//
// NAMES_JSON holds the candidate node names (a JSON array); PODS_JSONL one pod
// manifest per line. For each pod it posts filter with every name (in a new order
// each time, as kube-scheduler's parallel filter lists them), prioritize with
// the names that passed (when more than one did), then bind to the best-scored node,
// as kube-scheduler's extender client does. For each pod it prints one line:
//
//	ROUND_TRIP_NS JSON_NS
//
// the wall clock of filter and prioritize together (marshalling the arguments and
// decoding the results included, bind not), and how much of it went into the
// client's own JSON marshalling and decoding. It prints "error: ..." and exits 1 on
// the first failed call. Only the standard library, so `go build` needs nothing
// beyond the Go toolchain.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"time"
)

// The extender/v1 types carry no json tags: keys are the Go field names.
type extenderArgs struct {
	Pod       json.RawMessage
	Nodes     *struct{}
	NodeNames *[]string
}

type filterResult struct {
	Nodes                      *struct{}
	NodeNames                  *[]string
	FailedNodes                map[string]string
	FailedAndUnresolvableNodes map[string]string
	Error                      string
}

type hostPriority struct {
	Host  string
	Score int64
}

type bindingArgs struct {
	PodName      string
	PodNamespace string
	PodUID       string
	Node         string
}

type bindingResult struct {
	Error string
}

type podMeta struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		UID       string `json:"uid"`
	} `json:"metadata"`
}

type caller struct {
	client   *http.Client
	prefix   string
	jsonTime time.Duration
}

// post marshals args, posts them to verb and decodes a 200 answer into result,
// adding the time spent in encoding/json to c.jsonTime.
func (c *caller) post(verb string, args interface{}, result interface{}) error {
	started := time.Now()
	body, err := json.Marshal(args)
	if err != nil {
		return err
	}
	c.jsonTime += time.Since(started)
	req, err := http.NewRequest("POST", c.prefix+"/"+verb, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: %s", verb, resp.StatusCode, answer)
	}
	started = time.Now()
	err = json.Unmarshal(answer, result)
	c.jsonTime += time.Since(started)
	return err
}

func best(passed []string, scores []hostPriority) string {
	byHost := make(map[string]int64, len(scores))
	for _, s := range scores {
		byHost[s.Host] = s.Score
	}
	chosen := ""
	for _, name := range passed {
		if chosen == "" || byHost[name] > byHost[chosen] ||
			(byHost[name] == byHost[chosen] && name < chosen) {
			chosen = name
		}
	}
	return chosen
}

func run(prefix, namesPath, podsPath string) error {
	raw, err := os.ReadFile(namesPath)
	if err != nil {
		return err
	}
	var names []string
	if err := json.Unmarshal(raw, &names); err != nil {
		return fmt.Errorf("%s: %v", namesPath, err)
	}
	pods, err := os.Open(podsPath)
	if err != nil {
		return err
	}
	defer pods.Close()
	c := &caller{client: &http.Client{Timeout: 60 * time.Second}, prefix: prefix}
	order := rand.New(rand.NewSource(1))
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	lines := bufio.NewScanner(pods)
	lines.Buffer(make([]byte, 1<<20), 1<<24)
	for lines.Scan() {
		manifest := json.RawMessage(append([]byte(nil), lines.Bytes()...))
		var meta podMeta
		if err := json.Unmarshal(manifest, &meta); err != nil {
			return fmt.Errorf("%s: %v", podsPath, err)
		}
		// kube-scheduler lists the nodes that pass its own filters as its parallel
		// workers finish: each pod's candidates come in another order.
		candidates := append([]string(nil), names...)
		order.Shuffle(len(candidates), func(i, j int) {
			candidates[i], candidates[j] = candidates[j], candidates[i]
		})
		c.jsonTime = 0
		started := time.Now()
		var filtered filterResult
		if err := c.post("filter", extenderArgs{Pod: manifest, NodeNames: &candidates}, &filtered); err != nil {
			return err
		}
		if filtered.Error != "" {
			return fmt.Errorf("filter: %s", filtered.Error)
		}
		var passed []string
		if filtered.NodeNames != nil {
			passed = *filtered.NodeNames
		}
		var scores []hostPriority
		if len(passed) > 1 {
			if err := c.post("prioritize", extenderArgs{Pod: manifest, NodeNames: &passed}, &scores); err != nil {
				return err
			}
		}
		elapsed := time.Since(started)
		fmt.Fprintf(out, "%d %d\n", elapsed.Nanoseconds(), c.jsonTime.Nanoseconds())
		if node := best(passed, scores); node != "" {
			var bound bindingResult
			args := bindingArgs{meta.Metadata.Name, meta.Metadata.Namespace, meta.Metadata.UID, node}
			if err := c.post("bind", args, &bound); err != nil {
				return err
			}
			if bound.Error != "" {
				return fmt.Errorf("bind %s: %s", meta.Metadata.Name, bound.Error)
			}
		}
	}
	return lines.Err()
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: schedulercaller URL_PREFIX NAMES_JSON PODS_JSONL")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], os.Args[3]); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
}
