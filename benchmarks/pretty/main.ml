(* Generates programs of the toy language and pretty-prints each at several margins into
   a Buffer through a Format.formatter; prints line counts, widths and a checksum. *)

let fnv h s =
  let h = ref h in
  String.iter (fun c -> h := ((!h lxor Char.code c) * 0x01000193) land 0xffffffff) s;
  !h

let () =
  let count = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 10 in
  let margins = [ 30; 50; 80; 120 ] in
  let buf = Buffer.create 65536 in
  let ppf = Format.formatter_of_buffer buf in
  let stats = List.map (fun m -> (m, ref 0, ref 0, ref 0x811c9dc5)) margins in
  for i = 1 to count do
    let prog = Doc.program (1000 + i) 7 in
    List.iter
      (fun (m, lines, widest, h) ->
        Buffer.clear buf;
        Format.pp_set_margin ppf m;
        Format.pp_set_max_indent ppf (m - 10);
        Printer.program ppf prog;
        let text = Buffer.contents buf in
        List.iter
          (fun l -> incr lines; widest := max !widest (String.length l))
          (String.split_on_char '\n' text);
        h := fnv !h text)
      stats
  done;
  Printf.printf "%d programs\n" count;
  List.iter
    (fun (m, lines, widest, h) -> Printf.printf "margin %3d: lines %d widest %d fnv %08x\n" m !lines !widest !h)
    stats
