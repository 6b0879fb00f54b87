let () =
  let n = int_of_string Sys.argv.(1) in
  let r = ref 0 in
  for k = 1 to 200 do r := (!r + Vec.sum_squares (n + k)) land 0xffffff done;
  Printf.printf "n %d sum %d\n" n !r
