// Command negt2i-go is a small Go client of the negt2i.v1 Evaluator, written from docs/api.md and the
// published protos alone (stubs generated with Debian's protoc, protoc-gen-go and protoc-gen-go-grpc; see
// clients/go/README.md). It prints one JSON value per line:
//
//	negt2i-go -target HOST:PORT health [NAME]     the status and the stage details (trailing metadata)
//	negt2i-go -target HOST:PORT info              ServiceInfo as proto3 JSON
//	negt2i-go -target HOST:PORT evaluate FOLDER   one Evaluate call per image of a GenEval-layout folder
//	                                              (FOLDER/NNNNN/metadata.jsonl, samples/*.png), the prompt
//	                                              named by its id (the orchestrator's corpus must hold it)
//	negt2i-go -target HOST:PORT stream FOLDER     the same items over one EvaluateStream
//
// A failed call prints {"request_id", "error": {code, message, reason, metadata, violations}} decoded from
// the rich error model (google.rpc.Status with ErrorInfo / BadRequest in the grpc-status-details-bin trailer).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	pb "example.com/negt2i/negt2iv1"
)

var marshal = protojson.MarshalOptions{UseProtoNames: true}

// item is one image of the folder: its results-file filename (the request_id), bytes and prompt id.
type item struct {
	name, promptID string
	data           []byte
}

func printJSON(v interface{}) {
	out, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println(string(out))
}

func raw(m proto.Message) json.RawMessage {
	out, err := marshal.Marshal(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	return json.RawMessage(out)
}

// richError decodes a status the way docs/api.md ("Errors and status codes") says: its code and message,
// then the google.rpc details (status.Details decodes them with whichever protobuf runtime grpc-go links).
func richError(st *status.Status) map[string]interface{} {
	out := map[string]interface{}{"code": int32(st.Code()), "code_name": st.Code().String(), "message": st.Message()}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *errdetails.ErrorInfo:
			out["reason"] = d.GetReason()
			out["domain"] = d.GetDomain()
			out["metadata"] = d.GetMetadata()
		case *errdetails.BadRequest:
			var violations []map[string]string
			for _, v := range d.GetFieldViolations() {
				violations = append(violations, map[string]string{"field": v.GetField(), "description": v.GetDescription()})
			}
			out["violations"] = violations
		}
	}
	return out
}

func readFolder(folder string) ([]item, error) {
	metas, err := filepath.Glob(filepath.Join(folder, "*", "metadata.jsonl"))
	if err != nil {
		return nil, err
	}
	sort.Strings(metas)
	var items []item
	for _, meta := range metas {
		f, err := os.Open(meta)
		if err != nil {
			return nil, err
		}
		line, err := bufio.NewReader(f).ReadString('\n')
		f.Close()
		if err != nil && err != io.EOF {
			return nil, err
		}
		var record struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(line), &record); err != nil {
			return nil, fmt.Errorf("%s: %v", meta, err)
		}
		images, _ := filepath.Glob(filepath.Join(filepath.Dir(meta), "samples", "*.png"))
		sort.Strings(images)
		for _, image := range images {
			data, err := os.ReadFile(image)
			if err != nil {
				return nil, err
			}
			rel, _ := filepath.Rel(folder, image)
			items = append(items, item{name: filepath.ToSlash(rel), promptID: record.ID, data: data})
		}
	}
	return items, nil
}

func request(it item) *pb.EvaluateRequest {
	return &pb.EvaluateRequest{
		RequestId:    it.name,
		PromptSource: &pb.EvaluateRequest_PromptId{PromptId: it.promptID},
		Image:        &pb.Image{Data: it.data, MediaType: "image/png"},
	}
}

func main() {
	target := flag.String("target", "127.0.0.1:50051", "the orchestrator's host:port (plaintext)")
	timeout := flag.Duration("timeout", 60*time.Second, "deadline of each call")
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: negt2i-go -target HOST:PORT health [NAME] | info | evaluate FOLDER | stream FOLDER")
		os.Exit(2)
	}
	conn, err := grpc.Dial(*target, grpc.WithInsecure()) // grpc-go 1.33 (Debian 12) has no credentials/insecure
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer conn.Close()
	client := pb.NewEvaluatorClient(conn)
	failed := false
	switch args[0] {
	case "health":
		name := ""
		if len(args) > 1 {
			name = args[1]
		}
		var trailer metadata.MD
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: name}, grpc.Trailer(&trailer))
		cancel()
		if err != nil {
			printJSON(map[string]interface{}{"error": richError(status.Convert(err))})
			os.Exit(1)
		}
		details := map[string]string{}
		for key, values := range trailer {
			if strings.HasPrefix(key, "negt2i-stage-") && len(values) > 0 {
				details[strings.TrimPrefix(key, "negt2i-stage-")] = values[0]
			}
		}
		printJSON(map[string]interface{}{"status": resp.GetStatus().String(), "details": details})
	case "info":
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		info, err := client.GetServiceInfo(ctx, &pb.GetServiceInfoRequest{})
		cancel()
		if err != nil {
			printJSON(map[string]interface{}{"error": richError(status.Convert(err))})
			os.Exit(1)
		}
		printJSON(raw(info))
	case "evaluate", "stream":
		if len(args) < 2 {
			fmt.Fprintln(os.Stderr, args[0]+" needs a folder")
			os.Exit(2)
		}
		items, err := readFolder(args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if args[0] == "evaluate" {
			for _, it := range items {
				ctx, cancel := context.WithTimeout(context.Background(), *timeout)
				resp, err := client.Evaluate(ctx, request(it))
				cancel()
				if err != nil {
					failed = true
					printJSON(map[string]interface{}{"request_id": it.name, "error": richError(status.Convert(err))})
					continue
				}
				printJSON(map[string]interface{}{"request_id": resp.GetRequestId(), "verdict": raw(resp.GetVerdict())})
			}
		} else {
			failed = stream(client, items, *timeout*time.Duration(len(items)+1))
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown command "+args[0])
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// stream sends every item on one EvaluateStream (never more unanswered than the server's
// negt2i-max-in-flight grant) and prints each answer; true when an item failed.
func stream(client pb.EvaluatorClient, items []item, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	call, err := client.EvaluateStream(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	header, err := call.Header()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	window := 8
	if grant := header.Get("negt2i-max-in-flight"); len(grant) > 0 {
		fmt.Sscanf(grant[0], "%d", &window)
	}
	slots := make(chan struct{}, window)
	go func() {
		for _, it := range items {
			slots <- struct{}{}
			if err := call.Send(request(it)); err != nil {
				break
			}
		}
		call.CloseSend()
	}()
	failed := false
	for range items {
		resp, err := call.Recv()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		<-slots
		if e := resp.GetError(); e != nil {
			failed = true
			printJSON(map[string]interface{}{"request_id": resp.GetRequestId(), "error": richError(status.FromProto(e.GetStatus())),
				"stage": e.GetStage()})
			continue
		}
		printJSON(map[string]interface{}{"request_id": resp.GetRequestId(), "verdict": raw(resp.GetResult().GetVerdict())})
	}
	return failed
}
