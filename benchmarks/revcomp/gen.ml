(* Builds a fasta-formatted input in memory: several records, each a header line and a
   sequence in 60-column lines over upper- and lower-case IUB codes. *)

let alphabet = "ACGTACGTACGTacgtNRYKMSWBDHVnrykmswbdhv"

let make ~records ~letters =
  let buf = Buffer.create (letters + (letters / 50)) in
  let seed = ref 2024 in
  let rand bound =
    seed := ((!seed * 25214903917) + 11) land 0xffffffffffff;
    (!seed lsr 16) mod bound
  in
  for r = 1 to records do
    Printf.bprintf buf ">SEQ%d RECORD %d OF %d\n" r r records;
    let len = (letters / records) + rand 1000 in
    let col = ref 0 in
    for _ = 1 to len do
      (* mostly plain bases, an ambiguity code now and then *)
      let k = if rand 16 = 0 then rand (String.length alphabet) else rand 12 in
      Buffer.add_char buf alphabet.[k];
      incr col;
      if !col = 60 then (Buffer.add_char buf '\n'; col := 0)
    done;
    if !col > 0 then Buffer.add_char buf '\n'
  done;
  Buffer.contents buf
