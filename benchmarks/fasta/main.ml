(* fasta: a repeated sequence, then two random sequences drawn with the benchmark's LCG
   from cumulative probability tables, cut into 60-column lines and summarised. *)

module Out = Sink.Tee (Sink.Fnv) (Sink.Counts)

let width = 60

(* Emits [n] symbols produced by [next] in lines of [width]. *)
let emit title n (next : unit -> char) =
  let sink = Out.create () in
  let line = Bytes.create width in
  let rec go left =
    if left > 0 then begin
      let len = min width left in
      for i = 0 to len - 1 do Bytes.unsafe_set line i (next ()) done;
      Out.line sink line len;
      go (left - len)
    end
  in
  go n;
  Printf.printf "%s: %d symbols\n  %s\n" title n (Out.report sink)

let repeat_source s =
  let pos = ref 0 and len = String.length s in
  fun () ->
    let c = String.unsafe_get s !pos in
    incr pos;
    if !pos = len then pos := 0;
    c

let random_source g table () = Table.pick table (Lcg.next g 1.0)

(* A 287-symbol repeat unit built from a fixed rule (stands in for the ALU sequence). *)
let repeat_unit =
  String.init 287 (fun i -> "GCTA".[((i * i * 7) + (i * 3) + (i / 5)) land 3])

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 1000 in
  let g = Lcg.create 42 in
  emit "ONE repeat" (2 * n) (repeat_source repeat_unit);
  emit "TWO IUB ambiguity codes" (3 * n) (random_source g Table.iub);
  emit "THREE Homo sapiens frequency" (5 * n) (random_source g Table.homo_sapiens);
  Printf.printf "final seed %d\n" g.Lcg.seed
