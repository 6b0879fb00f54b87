(* Formats many records with Printf and Format into buffers and prints only the size,
   a checksum and a few lines of the result. *)
open Report

let words = [| "alpha"; "bravo"; "charlie"; "delta"; "echo"; "foxtrot"; "golf"; "hotel" |]

let item i =
  { sku = (i * 7919) land 0xffffff;
    label = words.(i mod 8) ^ string_of_int (i mod 100);
    qty = (i * 37) mod 1000;
    price = float ((i * 131) mod 100000) /. 7.;
    tags = List.init (i mod 4) (fun k -> words.((i + k) mod 8)) }

let fnv s =
  let h = ref 0x0bf29ce484222325 in
  String.iter (fun c -> h := (!h lxor Char.code c) * 0x100000001b3) s;
  !h land 0xffffffffffff

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 1000 in
  let pbuf = Buffer.create 65536 and fbuf = Buffer.create 65536 in
  let ppf = Format.formatter_of_buffer fbuf in
  Format.pp_set_margin ppf 72;
  let total = ref 0 in
  for i = 1 to n do
    let it = item i in
    line pbuf it;
    Format.fprintf ppf "%a@." pp_item it;
    total := !total + (it.qty * int_of_float (it.price *. 100.));
    if i mod 5 = 0 then begin
      Printf.bprintf pbuf "subtotal %d: " i;
      money pbuf (!total mod 100_000_000);
      Buffer.add_char pbuf '\n'
    end
  done;
  Format.pp_print_flush ppf ();
  let p = Buffer.contents pbuf and f = Buffer.contents fbuf in
  Printf.printf "printf: %d bytes, hash %012x\n" (String.length p) (fnv p);
  Printf.printf "format: %d bytes, hash %012x\n" (String.length f) (fnv f);
  let first_line s = match String.index_opt s '\n' with Some k -> String.sub s 0 k | None -> s in
  Printf.printf "%s\n%s\n" (first_line p) (first_line f)
