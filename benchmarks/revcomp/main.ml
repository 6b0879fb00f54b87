(* reverse-complement: reads an internally generated fasta text, writes each record's
   reverse complement in 60-column lines to a buffer, and prints checksums. *)

let fnv s =
  let h = ref 0x811c9dc5 in
  String.iter (fun c -> h := ((!h lxor Char.code c) * 0x01000193) land 0xffffffff) s;
  !h

let revcomp_text input =
  let out = Buffer.create (String.length input) in
  let records = ref 0 and bases = ref 0 in
  Records.iter input (fun h seq ->
      incr records;
      bases := !bases + Bytes.length seq;
      Complement.reverse_complement seq 0 (Bytes.length seq);
      Buffer.add_char out '>';
      Buffer.add_string out h;
      Buffer.add_char out '\n';
      Records.wrap out 60 seq);
  (Buffer.contents out, !records, !bases)

let () =
  let letters = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 100000 in
  let passes = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let input = Gen.make ~records:5 ~letters in
  let text = ref input and acc = ref 0 in
  for p = 1 to passes do
    let out, records, bases = revcomp_text !text in
    acc := (!acc * 31 + fnv out) land 0xffffffff;
    if p = 1 then Printf.printf "pass 1: %d records, %d bases, %d bytes, fnv %08x\n" records bases (String.length out) (fnv out);
    text := out
  done;
  Printf.printf "passes %d, round trip %s, combined %08x\n" passes
    (if passes mod 2 = 0 then string_of_bool (String.equal !text (String.uppercase_ascii input)) else "n/a")
    !acc;
  let count c = let k = ref 0 in String.iter (fun d -> if d = c then incr k) !text; !k in
  Printf.printf "final A %d C %d G %d T %d N %d\n" (count 'A') (count 'C') (count 'G') (count 'T') (count 'N')
