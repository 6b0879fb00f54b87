(* Splits fasta text into records and re-wraps sequences.  The end of the input is
   signalled by Not_found from String.index_from. *)

exception Done

let line_end s pos = try String.index_from s pos '\n' with Not_found -> String.length s

(* [iter s f] calls [f header seq] for each record, [seq] a fresh Bytes with the line
   breaks removed. *)
let iter s f =
  let n = String.length s in
  let seq = Buffer.create 65536 in
  let rec header pos =
    if pos >= n then raise Done;
    let e = line_end s pos in
    let h = String.sub s (pos + 1) (e - pos - 1) in
    Buffer.clear seq;
    body h (e + 1)
  and body h pos =
    if pos >= n || s.[pos] = '>' then begin
      f h (Buffer.to_bytes seq);
      header pos
    end else begin
      let e = line_end s pos in
      Buffer.add_substring seq s pos (e - pos);
      body h (e + 1)
    end
  in
  try header 0 with Done -> ()

let wrap out width b =
  let len = Bytes.length b in
  let rec go pos =
    if pos < len then begin
      let k = min width (len - pos) in
      Buffer.add_subbytes out b pos k;
      Buffer.add_char out '\n';
      go (pos + k)
    end
  in
  go 0
